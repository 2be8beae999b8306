"""Reading runs back: depth diagnostics (diagnostics, the diagnose stage) and the HTML report
(figures, html). The report reads run files only and imports no torch."""

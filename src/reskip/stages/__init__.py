"""The top floor under the command line: one module per command, each one function of the same shape,
`<command>(run, options) -> Path | None`: the folder it reads or writes (None where the options name it) and its
typed options in, the main file it wrote out. Each calls the library below it; no library module imports this
package, and importing it loads nothing (each stage imports what it needs when called).

- `compress`: the product: a user's model to a smaller one, healed toward it, exported and measured;
- `export`: a healing run as a plain Hugging Face folder;
- `generate`: a reply from any kind of the one table (a run under a skip policy, a healing run, an exported folder,
  the backbone with blocks removed);
- `evaluate`: every method against the backbone;
- `train`, `parity`, `calibrate`, `diagnose`, `report`, `run`, `experiment`: the source design's pipeline and its
  experiments (the research layer, `reskip.research`).
"""

"""What measures rather than runs: signal health, the signal test, the cost probe, and the bootstrap they report with."""

"""The stages, one module each: what a command runs on a run folder and writes into it, with typed options in and
files out (the pipeline and the CLI call these, nothing else).

- `options`: the options every stage shares (the backbone's fields, the presets) and `reskip run`'s;
- `inputs`: the preamble every stage after training runs (the run opened, the data read, the splits checked);
- `parity`: the retrofit at its identity against the backbone, to the bit;
- `train`: the one training loop's entry, for any trainee (the retrofit's side-channel, a LoRA arm);
- `calibrate`: thresholds and budgets from the calibration split;
- `evaluate`: every method against the backbone (perplexity, KL, top-1 agreement, compute spent);
- `diagnose`: the routing's health, the signal test, the memory table;
- `report`: the HTML page that reads the files the others wrote;
- `export`: a trained arm as a plain Hugging Face folder;
- `compress`: a user's model to a smaller one, healed, exported and measured, in one command;
- `experiment`: the experiments' arms and their tables.

Importing the package loads nothing: each stage imports what it needs.
"""

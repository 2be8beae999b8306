"""Training the side-channel: config, objective (the loss terms), schedules, loop, log, checkpoint,
validation."""

"""Training the side-channel: objective (the loss terms), schedules, loop, log, checkpoint,
validation."""

"""`reskip lab RUN`: the causal lab (the second source document's predict -> change one variable -> run ->
explain the delta) on a trained run, served on the loopback interface."""

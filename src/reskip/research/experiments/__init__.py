"""`reskip experiment NAME`: the source documents' claims as runnable experiments, each writing
OUT/results.json and OUT/results.md (claim | what was measured | verdict). Built over the library:
they compose training, calibration and the signal test, and nothing below imports them."""

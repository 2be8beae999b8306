"""What a user would do instead of the retrofit: a parameter-matched LoRA on the frozen backbone, and static
pruning of the cheapest blocks healed by that LoRA (`train`), exported as a plain Hugging Face model (`export`)."""

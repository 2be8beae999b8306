"""`reskip compress`: from a user's model to a smaller plain Hugging Face model that stays close to it."""

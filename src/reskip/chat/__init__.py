"""The model's own conversations: its chat template read as a user would meet it, batched sampling of what it writes
(Magpie-style user turns, its replies), the held-out chat prompt sets the evaluator measures on, and the healing data
it writes itself (`self` data, or the user's own prompts answered by it)."""

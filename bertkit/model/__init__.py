"""The model: keras-hub's BERT backbone from a preset or checkpoint, its tokenizer, and the
packed forward pass training uses."""

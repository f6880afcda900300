"""A fine-tuned model after training: loaded from its run directory (`finetuned`), predicting
over featurized rows (`inference`), and exported as a raw-text SavedModel (`export`)."""

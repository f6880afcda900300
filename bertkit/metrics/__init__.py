"""Metrics several tasks share: `token_accuracy` (a Keras training metric over the positions
a loss learns from) and `correlation` (Pearson's and Spearman's, for scores against gold
scores: embedding similarities, regression)."""

"""Recipes: the YAML a run is made from, its strict schema, and its `search:` section.

Loading a recipe imports neither TensorFlow nor Keras (`recipe.load_recipe`).
"""

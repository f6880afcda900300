"""TensorFlow SavedModel export: raw strings in, decoded predictions out.

Tokenization (tf-text), the model and the task's decoding all run in the
graph, so the SavedModel needs only `tensorflow` and `tensorflow_text` to
serve: no bertkit, Keras or keras-hub. Labels and tokenizer settings travel
inside it (as graph constants and in `assets/bertkit.json`).
"""

from __future__ import annotations

import json
from pathlib import Path

from bertkit.errors import UserError


def export_saved_model(task, model, directory, metadata: dict) -> Path:
    """Writes `directory` with a `serving_default` signature of `task.serve`."""
    import keras

    if keras.backend.backend() != "tensorflow":
        raise UserError("SavedModel export needs the TensorFlow backend "
                        "(unset KERAS_BACKEND or set it to 'tensorflow')")
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise UserError("export folder exists and is not empty; choose another", source=directory)
    specs = task.serving_inputs()  # name -> tf.TensorSpec(name=name): the signature's keys
    names = list(specs)

    def serve(*tensors):
        return task.serve(model, dict(zip(names, tensors, strict=True)))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(task.tokenizer.fast_tokenizer)
    archive.add_endpoint("serving_default", serve, input_signature=list(specs.values()))
    archive.write_out(str(directory), verbose=False)
    assets = directory / "assets"
    assets.mkdir(exist_ok=True)
    (assets / "bertkit.json").write_text(json.dumps(metadata, indent=2))
    return directory

"""`bertkit serve ONNX_DIR`: an ONNX folder of `bertkit export --format onnx` behind the same
server as a run, without TensorFlow.

`OnnxService` gives an `OnnxModel` the face the server serves a fine-tuned model by: inputs
checked as `predict` checks them (`bertkit.serving.inputs`), the three stages a server runs
(featurize on arrival, the rows of requests that arrive together in one onnxruntime call,
decode), the task's predict options, and `GET /metadata` from the folder's
`bertkit_onnx.json`. An int8 folder (`--quantize int8`) is served the same way.

Example:
    >>> service = OnnxService.load("exported/sst2-onnx")            # doctest: +SKIP
    >>> service.predict_examples(service.parse_inputs(["a fine film"]))  # doctest: +SKIP
    [{'label': 'positive', 'score': 0.97, 'probabilities': {...}}]
"""

from __future__ import annotations

import dataclasses
from importlib.util import find_spec
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS
from bertkit.serving import inputs as checks
from bertkit.serving.onnx_runtime import OnnxModel, OnnxRows


@dataclasses.dataclass
class OnnxRequest:
    """One request's examples and their rows, as the batcher sizes them."""

    examples: list
    features: OnnxRows | None  # None: no examples

    @property
    def rows(self) -> int:
        return 0 if self.features is None else len(self.features)

    @property
    def longest(self) -> int:
        return 0 if self.features is None else self.features.longest


class OnnxService:
    """An `OnnxModel` as `bertkit serve` serves a model (see the module docstring)."""

    def __init__(self, model: OnnxModel, source):
        self.model, self.task, self.source = model, model.task, Path(source)
        self.description = {"sequence_length": model.task.sequence_length}

    @classmethod
    def load(cls, directory) -> OnnxService:
        """The folder's model; a `UserError` names the `onnx` extra's missing packages."""
        missing = [name for name in ("onnxruntime", "tokenizers") if find_spec(name) is None]
        if missing:
            raise UserError(
                f"serving an ONNX folder needs the onnx extra (missing: {', '.join(missing)}): "
                "pip install 'bertkit[onnx]'",
                source=directory,
            )
        return cls(OnnxModel.load(directory), directory)

    @property
    def takes_text_pairs(self) -> bool:
        return checks.takes_text_pairs(self.task)

    def parse_inputs(self, inputs: list, *, max_input_characters: int = MAX_INPUT_CHARACTERS):
        """The task's examples for `inputs`; the first that cannot be predicted is a
        `UserError` naming it (`input 3: ...`)."""
        return checks.parse_inputs(self.task, inputs, max_input_characters)

    def predict_examples(self, examples: list, batch_size: int | None = None) -> list[dict]:
        request = self.prepare(examples)
        (outputs,) = self.run_prepared([request], batch_size)
        return self.finish(request, outputs)

    def prepare(self, examples: list) -> OnnxRequest:
        return OnnxRequest(examples, self.model.featurize(examples) if examples else None)

    def run_prepared(self, requests: list, batch_size: int | None = None) -> list[list]:
        """Each request's logits (one array a row), from onnxruntime calls over all their
        rows together, `batch_size` rows a call."""
        token_ids = [ids for r in requests if r.features for ids in r.features.token_ids]
        segment_ids = [ids for r in requests if r.features for ids in r.features.segment_ids]
        logits = self.model.logits(token_ids, segment_ids, batch_size or 64) if token_ids else []
        outputs, first = [], 0
        for request in requests:
            outputs.append(logits[first : first + request.rows])
            first += request.rows
        return outputs

    def finish(self, request: OnnxRequest, logits: list) -> list[dict]:
        if request.features is None:
            return []
        return self.model.decode(request.examples, request.features, logits)

    def metadata(self, limits: dict) -> dict:
        """What `GET /metadata` answers for a served ONNX folder."""
        metadata = self.model.metadata
        quantization = metadata.get("quantization") or {}
        return {
            "task": self.task.name,
            "description": type(self.task).description,
            "labels": list(getattr(self.task, "labels", None) or []) or None,
            "takes_text_pairs": self.takes_text_pairs,
            "predict_options": [option.keyword for option in self.task.predict_options],
            "model_card": {
                "name": metadata.get("run") or self.source.resolve().name,
                "format": f"onnx (opset {metadata.get('opset')})",
                "quantization": quantization.get("quantization"),
                "sequence_length": self.task.sequence_length,
            },
            "limits": limits,
        }

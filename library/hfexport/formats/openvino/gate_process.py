"""OpenVINO's side of the gate's artifact process (`hfexport.verify.artifact`): a stateful decode compiled for the CPU
as the in-process gate compiles it (`hfexport.verify.check._load`: the engine's `OpenVINOModelRunner.from_program`
on `read_model`'s program, its latency hint, the precision pinned by `INFERENCE_PRECISION_HINT` where one is asked,
the `.bin`'s pages handed back as the plugin repacks them), run as `hfexport.generate` runs it, without torch.

`open_component(entry, precision)` (the precision the check asks: "f32" for the graph check, the recipe's pin or
"auto" for the runtime check, `OpenvinoFormat.load_options`), `opening(folder)` and `running(folder)` (the artifact's
mapped pages handed back while the plugin compiles and while the graphs run: `hfexport.files.dropping_mapped_folder`,
as `_load` and `_dropping_read_again` do in process).
"""

from __future__ import annotations

from hfexport.files import dropping_mapped_folder
from hfexport.formats import format_traits
from hfexport.machine import read_openvino

#: The CPU compile properties the engine's runner sets under the caller's (`OpenVINOModelRunner.from_program`,
#: transformers 5.23: `{"PERFORMANCE_HINT": "LATENCY"}` for `CPU`)
CPU_DEFAULTS = {"PERFORMANCE_HINT": "LATENCY"}
#: The cache's leaves (a stateful decode keeps them in its infer request and takes none)
CACHE_PREFIX = "past_key_values."


def opening(folder):
    return dropping_mapped_folder(folder)


def running(folder):
    return dropping_mapped_folder(folder)


def open_component(entry: dict, precision: str | None) -> OpenvinoGateComponent:
    return OpenvinoGateComponent(entry["path"], precision or "auto")


class OpenvinoGateComponent:
    """One OpenVINO IR compiled for the CPU with one infer request: fed by leaf path (its ports' names, `input.` taken
    off, and the identity `beam_idx`, as the engine's `openvino_feed`), answering `{"logits": array}` read by port as
    `hfexport.generate.loop._stateful_logits` reads it (a bf16 result widened from its bits, as the engine's
    `openvino_output_tensor`). `unsupported`: a program that keeps no state (its probes would be compared, which this
    process does not do for OpenVINO): the caller checks it in process."""

    def __init__(self, path: str, precision: str):
        import openvino

        core = openvino.Core()
        config = format_traits("openvino").load_options(precision).get("config") or {}
        self.compiled = core.compile_model(core.read_model(path), "CPU", {**CPU_DEFAULTS, **config})
        self.request = self.compiled.create_infer_request()
        self.unsupported = None if list(self.request.query_state()) else "a program that keeps no cache state"
        self.bf16 = openvino.Type.bf16

    def read(self) -> dict:
        """What `hfexport.machine.read_back` reports of the component: its device(s) and compiled precision."""
        return read_openvino(self.compiled)

    def reset(self) -> None:
        """A new generation: the cache variables back to their zero-length init (as `GenerationSession` hands the
        state to the decode on an empty cache)."""
        self.request.reset_state()

    def __call__(self, leaves: dict, kwargs: list[str]) -> dict:
        import numpy

        batched = [path for path, value in leaves.items() if numpy.ndim(value)]
        batch_path = next((path for path in batched if path.startswith(CACHE_PREFIX)), batched[0] if batched else None)
        batch = numpy.shape(leaves[batch_path])[0] if batch_path is not None else 1
        feed = {}
        for port in self.compiled.inputs:
            for name in port.get_names():
                path = name.removeprefix("input.")
                if path in leaves:
                    feed[name] = numpy.ascontiguousarray(leaves[path])
                    break
                if name == "beam_idx":
                    feed[name] = numpy.arange(batch, dtype=numpy.int32)
                    break
            else:
                raise ValueError(f"The graph takes {port.get_any_name()}, which {kwargs} don't hold.")
        results = self.request.infer(feed)
        port = self.compiled.output("logits")
        value = results[port]
        if port.get_element_type() == self.bf16:  # NumPy has no bf16: the bits arrive as float16
            value = (value.view(numpy.uint16).astype(numpy.uint32) << 16).view(numpy.float32)
        return {"logits": value}

"""OpenVINO GenAI's VLMPipeline on a folder, greedy, from a text prompt and an image each: run by
hfexport.formats.openvino.runtimes.openvino_genai_vlm in the runtime's own environment (it never imports hfexport).

    python openvino_genai_vlm_client.py FOLDER REQUEST.json

REQUEST: {"prompts": [text], "expanded": [text], "images": [[[[r, g, b]]]] (uint8, height x width x 3, one per
prompt), "max_new_tokens", "eos_token_id": [ids]}. Prints one JSON line: the runtime's version, the new tokens per
prompt at an f32 inference precision hint ("f32"), and the ids VLMPipeline's tokenizer makes of each prompt with its
image tokens written out ("ids": `expanded`, as VLMPipeline expands it before tokenizing).
"""

import json
import sys

import numpy as np
import openvino as ov
import openvino_genai


class Tokens(openvino_genai.StreamerBase):
    """The new token ids, as VLMPipeline streams them (its results hold texts)."""

    def __init__(self):
        super().__init__()
        self.tokens = []

    def write(self, token):
        self.tokens += [int(one) for one in token] if isinstance(token, (list, tuple)) else [int(token)]
        return openvino_genai.StreamingStatus.RUNNING

    def end(self):
        pass


def main():
    folder, request_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    pipe = openvino_genai.VLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32")
    config = pipe.get_generation_config()
    config.max_new_tokens = request["max_new_tokens"]
    config.min_new_tokens = 0
    config.do_sample = False
    config.num_beams = 1
    config.ignore_eos = False
    config.apply_chat_template = False  # the prompt as given, as model.generate got it
    config.stop_token_ids = set(request["eos_token_id"])
    tokenizer = openvino_genai.Tokenizer(folder)
    answer = {"version": openvino_genai.__version__, "f32": [], "ids": []}
    for prompt, expanded, image in zip(request["prompts"], request["expanded"], request["images"], strict=True):
        pixels = ov.Tensor(np.asarray(image, dtype=np.uint8)[None])
        streamer = Tokens()
        pipe.generate(prompt, images=[pixels], generation_config=config, streamer=streamer)
        answer["f32"].append(streamer.tokens)
        answer["ids"].append([int(token) for token in tokenizer.encode(expanded).input_ids.data[0]])
    print(json.dumps(answer))


if __name__ == "__main__":
    main()

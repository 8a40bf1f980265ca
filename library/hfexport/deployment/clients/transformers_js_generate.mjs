// Greedy generation with transformers.js (@huggingface/transformers, Node) on an export (run where its
// node_modules/ is). It never imports hfexport.
// Args: MODELS_DIR MODEL REQUEST_JSON. MODELS_DIR/MODEL is laid out as a Hub repo (config.json at its root, the
// graph in onnx/model{dtype suffix}.onnx; config.json's transformers.js_config names its external data). REQUEST_JSON
// holds {"prompts": [[ids]], "max_new_tokens", "pad_token_id", "eos_token_id", "padded", "dtype"}. The model is
// opened with the dtype alone, as its users do. Prints one JSON line:
// {"version", "batch1": [[new ids]], "padded": [[new ids]] or null}.
import fs from "node:fs";
import { AutoModelForCausalLM, Tensor, env } from "@huggingface/transformers";

const [modelsDir, modelName, requestFile] = process.argv.slice(2);
const request = JSON.parse(fs.readFileSync(requestFile, "utf8"));
env.allowRemoteModels = false;
env.localModelPath = modelsDir;
const model = await AutoModelForCausalLM.from_pretrained(modelName, { dtype: request.dtype || "fp32", device: "cpu" });

async function generate(rows, masks) {
  const shape = [rows.length, rows[0].length];
  const input_ids = new Tensor("int64", BigInt64Array.from(rows.flat().map(BigInt)), shape);
  const attention_mask = new Tensor("int64", BigInt64Array.from(masks.flat().map(BigInt)), shape);
  const output = await model.generate({
    input_ids, attention_mask, max_new_tokens: request.max_new_tokens, do_sample: false,
    pad_token_id: request.pad_token_id, eos_token_id: request.eos_token_id,
  });
  return output.tolist().map((row) => row.slice(shape[1]).map(Number));
}

const batch1 = [];
for (const prompt of request.prompts) batch1.push((await generate([prompt], [prompt.map(() => 1)]))[0]);
let padded = null;
if (request.padded) {
  const width = Math.max(...request.prompts.map((p) => p.length));
  const rows = request.prompts.map((p) => [...Array(width - p.length).fill(request.pad_token_id), ...p]);
  const masks = request.prompts.map((p) => [...Array(width - p.length).fill(0), ...p.map(() => 1)]);
  padded = await generate(rows, masks);
}
const pkg = JSON.parse(fs.readFileSync(new URL("./node_modules/@huggingface/transformers/package.json",
                                               import.meta.url), "utf8"));
console.log(JSON.stringify({ version: pkg.version, batch1, padded }));

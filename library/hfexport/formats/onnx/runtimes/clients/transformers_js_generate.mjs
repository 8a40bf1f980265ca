// Greedy generation with transformers.js (@huggingface/transformers, Node) on an export (run where its
// node_modules/ is). It never imports hfexport.
// Args: MODELS_DIR MODEL REQUEST_JSON. MODELS_DIR/MODEL is laid out as a Hub repo (config.json at its root, the
// graph in onnx/model{dtype suffix}.onnx; config.json's transformers.js_config names its external data). REQUEST_JSON
// holds {"prompts": [[ids]], "max_new_tokens", "pad_token_id", "eos_token_id", "padded", "dtype", "external_data"}:
// the model is opened with the dtype alone, as its users do (plus use_external_data_format where "external_data" is
// set: an encoder-decoder's graphs). For an encoder-decoder also "is_encoder_decoder", "padding_side" and Whisper's
// "input_features" ([batch, mel bins, frames]): then AutoModelForSeq2SeqLM (or AutoModelForSpeechSeq2Seq) opens
// onnx/encoder_model.onnx + onnx/decoder_model_merged.onnx. Prints one JSON line:
// {"version", "batch1": [[new ids]], "padded": [[new ids]] or null} (an encoder-decoder's: after the decoder start).
// With "image_text" and "images" (per prompt, {input name: {"dims", "dtype", "data"}}: the processor's pixel_values,
// Idefics3's pixel_attention_mask),
// AutoModelForImageTextToText opens onnx/vision_encoder.onnx + onnx/embed_tokens.onnx + onnx/decoder_model_merged.onnx
// and generates each prompt with its images (batch 1).
import fs from "node:fs";
import {
  AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq, Tensor, env,
} from "@huggingface/transformers";

const [modelsDir, modelName, requestFile] = process.argv.slice(2);
const request = JSON.parse(fs.readFileSync(requestFile, "utf8"));
env.allowRemoteModels = false;
env.localModelPath = modelsDir;
const options = { dtype: request.dtype || "fp32", device: "cpu" };
if (request.external_data) options.use_external_data_format = true;
const seq2seq = Boolean(request.is_encoder_decoder);
const speech = seq2seq && Array.isArray(request.input_features);
const imageText = Boolean(request.image_text);
const Auto = imageText ? AutoModelForImageTextToText
  : speech ? AutoModelForSpeechSeq2Seq : seq2seq ? AutoModelForSeq2SeqLM : AutoModelForCausalLM;
const model = await Auto.from_pretrained(modelName, options);
const settings = {
  max_new_tokens: request.max_new_tokens, do_sample: false,
  pad_token_id: request.pad_token_id, eos_token_id: request.eos_token_id,
};

function features(rows) {
  const dims = [rows.length, rows[0].length, rows[0][0].length];
  return new Tensor("float32", Float32Array.from(rows.flat(2)), dims);
}

async function generateSeq2seq(rows, masks) {
  // The decoder sequences start with the decoder start token: the new tokens follow it.
  const output = speech
    ? await model.generate({ inputs: features(rows), ...settings })
    : await model.generate({
      input_ids: new Tensor("int64", BigInt64Array.from(rows.flat().map(BigInt)), [rows.length, rows[0].length]),
      attention_mask: new Tensor("int64", BigInt64Array.from(masks.flat().map(BigInt)), [rows.length, rows[0].length]),
      ...settings,
    });
  const start = request.decoder_start_token_id;
  return output.tolist().map((row) => row.map(Number)).map((row) => (start == null || row[0] === start ? row.slice(1) : row));
}

if (imageText) {
  const batch1 = [];
  for (const [index, prompt] of request.prompts.entries()) {
    const shape = [1, prompt.length];
    const images = Object.fromEntries(Object.entries(request.images[index]).map(
      ([name, { dims, dtype, data }]) => [name, new Tensor(dtype, dtype === "int64" ? BigInt64Array.from(data.map(BigInt))
        : dtype === "bool" ? Uint8Array.from(data.map(Number)) : Float32Array.from(data), dims)]));
    const output = await model.generate({
      input_ids: new Tensor("int64", BigInt64Array.from(prompt.map(BigInt)), shape),
      attention_mask: new Tensor("int64", BigInt64Array.from(prompt.map(() => 1n)), shape),
      ...images, ...settings,
    });
    batch1.push(output.tolist()[0].slice(prompt.length).map(Number));
  }
  const pkg = JSON.parse(fs.readFileSync(new URL("./node_modules/@huggingface/transformers/package.json",
                                                 import.meta.url), "utf8"));
  console.log(JSON.stringify({ version: pkg.version, batch1, padded: null }));
} else if (seq2seq) {
  const batch1 = [];
  const inputs = speech ? request.input_features : request.prompts;
  for (const row of inputs) batch1.push((await generateSeq2seq([row], speech ? null : [row.map(() => 1)]))[0]);
  let padded = null;
  if (request.padded) {
    const width = Math.max(...inputs.map((p) => p.length));
    const right = request.padding_side === "right";
    const pad = (p, value) => Array(width - p.length).fill(value);
    const rows = inputs.map((p) => (right ? [...p, ...pad(p, request.pad_token_id)] : [...pad(p, request.pad_token_id), ...p]));
    const masks = inputs.map((p) => (right ? [...p.map(() => 1), ...pad(p, 0)] : [...pad(p, 0), ...p.map(() => 1)]));
    padded = await generateSeq2seq(rows, masks);
  }
  const pkg = JSON.parse(fs.readFileSync(new URL("./node_modules/@huggingface/transformers/package.json",
                                                 import.meta.url), "utf8"));
  console.log(JSON.stringify({ version: pkg.version, batch1, padded }));
} else {

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
}

// Runs under Node with @huggingface/transformers (hfexport.testing.peers.node_modules): the published encoder's
// pipeline("feature-extraction") from a Hub at HOST (env.remoteHost), REPO at REVISION (refs/pr/N works).
// Args: HOST REPO REVISION CACHE_DIR SENTENCES_JSON [EXTERNAL_DATA] [DTYPE]. DTYPE picks the file in onnx/ by
// transformers.js' own names ("fp32": model.onnx, "q8": model_quantized.onnx, ...). Prints one JSON line: dims and
// the mean-pooled, normalized embeddings.
import { env, pipeline } from "@huggingface/transformers";

const [host, repo, revision, cacheDir, sentences, externalData, dtype] = process.argv.slice(2);
env.remoteHost = host.endsWith("/") ? host : host + "/";
env.remotePathTemplate = "{model}/resolve/{revision}/";
env.allowLocalModels = false;
env.cacheDir = cacheDir;
const options = { revision, dtype: dtype || "fp32", device: "cpu" };
if (externalData === "1") options.use_external_data_format = true;
const extractor = await pipeline("feature-extraction", repo, options);
const output = await extractor(JSON.parse(sentences), { pooling: "mean", normalize: true });
console.log(JSON.stringify({ dims: output.dims, data: Array.from(output.data) }));

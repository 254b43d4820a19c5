// Embeds passages with transformers.js from a model folder as it is (no network):
//   node transformers_js_embed.mjs FOLDER DTYPE PASSAGES.json MAX_TOKENS > embeddings.json
// DTYPE picks the graph as transformers.js names them: fp32 → onnx/model.onnx, q8 →
// onnx/model_quantized.onnx, q4 → onnx/model_q4.onnx. Prints the mean of last_hidden_state over
// real tokens per passage (what compressor bench compares), as a JSON list of lists.
import path from "node:path";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

// Found as require() finds it (NODE_PATH too), since import() looks only beside this file.
const where = createRequire(import.meta.url).resolve("@huggingface/transformers");
const { AutoModel, AutoTokenizer, env } = await import(pathToFileURL(where).href);

const [folder, dtype, passagesFile, maxTokens] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(folder));
const name = path.basename(path.resolve(folder));
const tokenizer = await AutoTokenizer.from_pretrained(name);
const model = await AutoModel.from_pretrained(name, { dtype, device: "cpu" });
const passages = JSON.parse(readFileSync(passagesFile, "utf8"));
const out = [];
for (let start = 0; start < passages.length; start += 32) {
  const inputs = tokenizer(passages.slice(start, start + 32), {
    padding: true,
    truncation: true,
    max_length: Number(maxTokens),
  });
  const { last_hidden_state } = await model(inputs);
  const [batch, tokens, width] = last_hidden_state.dims;
  const hidden = last_hidden_state.data;
  const mask = inputs.attention_mask.data;
  for (let b = 0; b < batch; b++) {
    const sum = new Float64Array(width);
    let count = 0;
    for (let t = 0; t < tokens; t++) {
      if (Number(mask[b * tokens + t]) === 0) continue;
      count++;
      for (let d = 0; d < width; d++) sum[d] += hidden[(b * tokens + t) * width + d];
    }
    out.push(Array.from(sum, (v) => v / count));
  }
}
process.stdout.write(JSON.stringify(out));

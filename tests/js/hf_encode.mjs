// Reference ids from Hugging Face's own JS implementation of tokenizer.json.
// Usage: node hf_encode.mjs tokenizer.json < lines.json   (a JSON array of strings)
// Prints a JSON array with the ids of each line.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const tokenizer = new Tokenizer(spec, {});
const lines = JSON.parse(readFileSync(0, "utf8"));
const out = lines.map((line) => tokenizer.encode(line, { add_special_tokens: false }).ids);
process.stdout.write(JSON.stringify(out));

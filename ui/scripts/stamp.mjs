// Writes studio-manifest.json into the built bundle: a hash of every input of the build, so
// that a Python test (no Node needed) can check the shipped bundle matches the committed source.
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const out = join(root, "../src/conch/web/studio/dist");
// Keep in sync with conch.web.studio.SOURCE_INPUTS.
const INPUTS = ["src", "index.html", "package.json", "package-lock.json", "vite.config.ts", "tsconfig.json"];

function walk(p) {
  const s = statSync(p);
  if (!s.isDirectory()) return [p];
  return readdirSync(p).flatMap((n) => walk(join(p, n)));
}

const files = INPUTS.flatMap((i) => walk(join(root, i)))
  .map((f) => relative(root, f).split("\\").join("/"))
  .sort();
const total = createHash("sha256");
for (const f of files) {
  const digest = createHash("sha256").update(readFileSync(join(root, f))).digest("hex");
  total.update(`${f}\0${digest}\n`);
}
const assets = walk(out)
  .map((f) => relative(out, f).split("\\").join("/"))
  .filter((f) => f !== "studio-manifest.json")
  .sort();
const manifest = { source_sha256: total.digest("hex"), source_files: files.length, assets };
writeFileSync(join(out, "studio-manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
console.log(`studio-manifest.json: source ${manifest.source_sha256.slice(0, 12)} (${files.length} files)`);

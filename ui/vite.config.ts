import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

// The bundle ships inside the Python package; the server serves it under /studio/.
export default defineConfig({
  plugins: [preact()],
  base: "/studio/",
  build: {
    outDir: "../src/conch/web/studio/dist",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
    reportCompressedSize: true,
    chunkSizeWarningLimit: 800,
  },
});

// What the serving process tells the app about itself (inlined into index.html by
// conch.web.studio, so the first paint needs no extra round trip).
export type StudioConfig = {
  pages: string[];
  server: "agent" | "inference";
  inference_port: number | null;
  version: string;
};

function read(): StudioConfig {
  const el = document.getElementById("conch-config");
  if (el?.textContent) {
    try {
      return JSON.parse(el.textContent) as StudioConfig;
    } catch {
      /* fall through to the development defaults */
    }
  }
  return {
    pages: ["playground", "chat", "models", "agents", "marketplace", "status"],
    server: "agent",
    inference_port: 8080,
    version: "dev",
  };
}

export const config = read();

/** Base URL of the inference server: this origin when it serves the app, else the same
 * host name on its own port (cross-origin, allowed by its CORS policy for this origin). */
export const inferenceBase =
  config.server === "inference" || config.inference_port == null
    ? ""
    : `${location.protocol}//${location.hostname}:${config.inference_port}`;

export const agentBase = config.server === "agent" ? "" : null;

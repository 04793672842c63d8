"""The `llada-lab` command: the research tools (training, corpus building, edit mining, fine-tuning,
the evaluations, ahead-of-time kernel builds), apart from the product's `llada-lsp`.

Only dispatches, through llada_lsp/cli.py's `dispatch` (so `--help` loads no torch, a typo gets the
closest name, Ctrl-C is one line): each subcommand's `<name>_main(argv)` owns its arguments and `--help`.
"""

from __future__ import annotations

import sys

from llada_lsp.cli import Subcommands, dispatch, listing

SUBCOMMANDS: Subcommands = {
    "train": ("train", "train_main", "train the embedded model (CPU, resumable)"),
    "corpus": ("corpus", "corpus_main", "rebuild the training corpus from its manifest (pip downloads, licences)"),
    "candidate": ("candidate", "candidate_main", "train a candidate model in a time budget, score it against the shipped one"),
    "eval-infill": ("eval_infill", "eval_infill_main", "score infill on held-out standard-library files"),
    "eval-rewrite": ("eval_rewrite", "eval_rewrite_main", "rewrite held-out selections: parsed, applied, refused"),
    "eval-typing": ("eval_typing", "eval_typing_main", "replay typing held-out files: what revisions save"),
    "edit-pairs": ("edit_pairs", "edit_pairs_main", "rebuild the next-edit cases from their manifest (git history)"),
    "tune-next-edit": ("tune_next_edit", "tune_next_edit_main", "fine-tune the embedded model on next edits (CPU, resumable)"),
    "tune-cross-file": ("tune_cross_file", "tune_cross_file_main", "fine-tune the embedded model to use other files' snippets (CPU)"),
    "eval-next-edit": ("eval_next_edit", "eval_next_edit_main", "next-edit suggestions on held-out commits, per configuration"),
    "compile-kernels": ("compile_kernels", "compile_kernels_main", "compile every Triton kernel variant for sm_80/sm_90, no GPU needed"),
}  # fmt: skip


def usage() -> str:
    lines = ["usage: llada-lab SUBCOMMAND [options] | llada-lab --version", "",
             "The research tools of llada-lsp; the data they read (manifests, the next-edit cases) is in the",
             "repository, so run them from a checkout.", "",
             "subcommands:", *listing(SUBCOMMANDS)]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return dispatch("llada-lab", "llada_lab.commands", SUBCOMMANDS, usage(), argv)


if __name__ == "__main__":
    raise SystemExit(main())

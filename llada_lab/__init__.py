"""llada-lab: the research tools around llada-lsp (training the embedded model, building its corpus,
mining and tuning next edits, the evaluations, ahead-of-time kernel builds), behind `llada-lab`.

The lab imports the product (llada_lsp) and never the other way round; the product's server is not
for the lab's training either (it replays cases through completion/, below the server). Its data (the
corpus and edit manifests, the next-edit case set) lives in the repository and is not in the wheel.
"""

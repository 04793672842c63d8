"""JointThresholdInDel, one step at a time, on hand-chosen logits: every rule of ../shared/LLADA22.md
(SGLang's step, deterministic) with the block each step must give worked out by hand in the comment
beside it. Ids: 0..7 words, EOS 8, DELETE 9, INSERT (split) 10, MASK 11; blocks of 6, the first
position a prompt token (5), so the generated part is positions 1..5.
"""

from __future__ import annotations

import math

import pytest
import torch

from llada_lsp.engine.policy import INDEL_PRESETS, InDelBlock, JointThresholdInDel, indel_candidates, indel_step

V, EOS, DEL, INS, M = 12, 8, 9, 10, 11
SPEED = INDEL_PRESETS["speed"]


def logits_for(block: list[int], choices: dict[int, list[tuple[int, float]]]) -> torch.Tensor:
    """[len(block), V] logits in float64 whose softmax gives position i the probabilities in
    choices[i] ((id, p) pairs; the rest shared by the other ids), and elsewhere its own id at 0.99."""
    out = torch.empty(len(block), V, dtype=torch.float64)
    for i, token in enumerate(block):
        want = dict(choices.get(i, [(token, 0.99)]))
        rest = (1 - sum(want.values())) / (V - len(want))
        out[i] = math.log(rest)
        for t, q in want.items():
            out[i, t] = math.log(q)
    return out


def step(block, orig, choices, rule=SPEED, budget=16, state=None):
    state = state or InDelBlock(1, list(orig))
    ids, probs = indel_candidates(logits_for(block, choices))
    out = indel_step(rule, state, list(block), ids.tolist(), probs.tolist(), M, DEL, INS, budget)
    return out, state


F, T = False, True


def test_candidates_are_ranked_with_their_probability_over_the_whole_vocabulary():
    ids, probs = indel_candidates(logits_for([5, M], {1: [(M, 0.5), (3, 0.3)]}), k=3)
    assert ids[1, :2].tolist() == [M, 3]  # MASK is not suppressed: the rule decides where it may not go
    assert probs[1, :2].tolist() == pytest.approx([0.5, 0.3])


def test_delete_removes_a_position_and_pads_with_an_introduced_mask():
    # [5 | 1 2 3 M M]: position 2 -> DELETE (0.9), mask 4 -> 4 (0.8), mask 5 -> 6 (0.3, under 0.5)
    # one original... two original masks, none introduced: at least 1 fill; 4 is above threshold
    # writes {2: DELETE, 4: 4}: [5 1 _ 3 4 M] -> [5 1 3 4 M] + pad [M] = [5 1 3 4 M M]
    out, state = step([5, 1, 2, 3, M, M], [F, F, F, F, T, T], {2: [(DEL, 0.9)], 4: [(4, 0.8)], 5: [(6, 0.3)]})
    assert out.tokens == [5, 1, 3, 4, M, M]
    assert state.is_orig == [F, F, F, T, T, F]  # the filled 4 keeps its flag; the pad is introduced
    assert out.filled == [3] and out.edited == [] and not out.done and out.changed


def test_insert_makes_a_mask_before_the_token_and_truncates():
    # [5 | 1 2 M M M]: position 2 -> INSERT (0.9), mask 3 -> 4 (0.7), masks 4, 5 -> 6 (0.2)
    # writes {2: INSERT, 3: 4}: [5 1 (M 2) 4 M M] is 7 long -> truncated to 6: [5 1 M 2 4 M]
    out, state = step(
        [5, 1, 2, M, M, M], [F, F, F, T, T, T], {2: [(INS, 0.9)], 3: [(4, 0.7)], 4: [(6, 0.2)], 5: [(6, 0.2)]}
    )
    assert out.tokens == [5, 1, M, 2, 4, M]
    assert state.is_orig == [F, F, F, F, T, T]  # the new mask is introduced; the last original mask fell off
    assert out.filled == [4]


def test_insert_on_a_mask_gives_two_masks_only_one_original():
    # [5 | 1 M M M M]: mask 2 -> INSERT (0.9), the others 6 at 0.2: one fill, the most confident
    # [5 1 (M M) M M M] -> truncated [5 1 M M M M]: the mask at 2 introduced, 3 keeps its flag
    out, state = step([5, 1, M, M, M, M], [F, F, T, T, T, T], {i: [(6, 0.2)] for i in (3, 4, 5)} | {2: [(INS, 0.9)]})
    assert out.tokens == [5, 1, M, M, M, M] and state.is_orig == [F, F, F, T, T, T]
    assert not out.changed  # the ids are as before, the flags are not: the budget sees one original mask fewer


def test_m2t_fills_one_more_than_the_introduced_masks():
    # [5 | 1 M M M 2]: mask 2 introduced, 3 and 4 original: at least 1 + 1 = 2 fills; only mask 3 is
    # above 0.5, so the two most confident: 3 (0.6) and 2 (0.45), not 4 (0.4)
    out, _ = step([5, 1, M, M, M, 2], [F, F, F, T, T, F], {2: [(6, 0.45)], 3: [(7, 0.6)], 4: [(4, 0.4)]})
    assert out.tokens == [5, 1, 6, 7, M, 2] and out.filled == [2, 3]
    # with enough above the threshold, all of them: 2 and 3 above 0.5 (the floor is 2), 4 under
    out, _ = step([5, 1, M, M, M, 2], [F, F, F, T, T, F], {2: [(6, 0.55)], 3: [(7, 0.6)], 4: [(4, 0.4)]})
    assert out.tokens == [5, 1, 6, 7, M, 2]


def test_an_original_mask_never_resolves_to_mask():
    # mask 5 (original) has MASK as argmax (0.6): it takes its best other id, 3 (0.3); as the only
    # mask it is filled (floor 1)
    out, _ = step([5, 1, 2, 3, 4, M], [F, F, F, F, F, T], {5: [(M, 0.6), (3, 0.3)]})
    assert out.tokens == [5, 1, 2, 3, 4, 3]


def test_with_no_original_mask_left_every_mask_is_filled_and_may_stay_a_mask():
    # [5 | 1 M M 2 3], both masks introduced: all masks are written; an introduced mask's argmax may be
    # MASK (0.7), which writes MASK again; the other gets 4 (0.2, under the threshold: filled anyway)
    out, state = step([5, 1, M, M, 2, 3], [F] * 6, {2: [(M, 0.7)], 3: [(4, 0.2)]})
    assert out.tokens == [5, 1, M, 4, 2, 3] and state.post_edit_steps == 1 and not out.done


def test_the_post_edit_budget_is_never_reset():
    # budget 2. Step 1: no original mask -> post 1; position 3 (an original mask once) -> MASK (0.9),
    # written by T2T: an original mask is back. Step 2: one original mask -> post stays 1 (the port of
    # the reference decoder would reset it to 0); it is filled with 7. Step 3: post 2 = budget -> cleanup.
    state = InDelBlock(1, [F, F, T, T, T, T])
    out, _ = step([5, 1, 2, 3, 4, 6], None, {3: [(M, 0.9)]}, budget=2, state=state)
    assert out.tokens == [5, 1, 2, M, 4, 6] and state.post_edit_steps == 1 and not out.cleanup
    out, _ = step(out.tokens, None, {3: [(7, 0.8)]}, budget=2, state=state)
    assert out.tokens == [5, 1, 2, 7, 4, 6] and state.post_edit_steps == 1 and not out.done
    out, _ = step(out.tokens, None, {4: [(3, 0.8)]}, budget=2, state=state)
    assert state.post_edit_steps == 2 and out.cleanup and out.done and out.tokens == [5, 1, 2, 7, 3, 6]


def test_cleanup_scrubs_mask_and_edit_ids():
    # budget 1, no original mask: this step is the cleanup. Mask 3 -> MASK (0.6) then 4 (0.3): 4;
    # mask 4 -> INSERT (0.5) then 7 (0.2): 7; position 2 -> DELETE (0.9) then 0 (0.05): 0 (a T2T edit,
    # scrubbed to its best id that is neither MASK nor an edit id)
    out, _ = step([5, 1, 2, M, M, 6], [F] * 6, {3: [(M, 0.6), (4, 0.3)], 4: [(INS, 0.5), (7, 0.2)],
                                                 2: [(DEL, 0.9), (0, 0.05)]}, budget=1)  # fmt: skip
    assert out.cleanup and out.done and out.changed
    assert out.tokens == [5, 1, 0, 4, 7, 6]
    assert not {M, DEL, INS} & set(out.tokens[1:])


def test_the_anti_loop_tries_another_id_at_the_least_sure_change():
    block, orig = [5, 1, 2, 3, M, M], [F, F, F, F, T, T]
    choices = {3: [(0, 0.95)], 4: [(7, 0.6), (M, 0.2), (2, 0.1)], 5: [(6, 0.1)]}
    # first time: writes {3: 0 (T2T), 4: 7 (M2T)}
    out, _ = step(block, orig, choices)
    assert out.tokens == [5, 1, 2, 0, 7, M]
    # the same input block again, 7 already tried at 4: the least sure change (4, p 0.6) takes its best
    # id not tried there and not MASK (an original mask): 2
    state = InDelBlock(1, list(orig), seen={tuple(block)}, tried={4: {7}})
    out, _ = step(block, orig, choices, state=state)
    assert out.tokens == [5, 1, 2, 0, 2, M]
    assert state.tried[4] == {7, 2} and state.tried[3] == {0}


def test_nothing_to_write_finishes_the_block_without_cleanup():
    out, state = step([5, 1, 2, 3, 4, 6], [F, F, T, T, T, T], {})
    assert out.done and not out.cleanup and not out.changed and state.post_edit_steps == 1


def test_budget_zero_makes_the_step_that_fills_the_last_original_mask_the_cleanup():
    # budget 0: mask 5, the last original one, -> DELETE (0.7) then 3 (0.2): as the cleanup it is scrubbed to 3
    out, _ = step([5, 1, 2, 3, 4, M], [F, F, F, F, F, T], {5: [(DEL, 0.7), (3, 0.2)]}, budget=0)
    assert out.cleanup and out.tokens == [5, 1, 2, 3, 4, 3]


def test_a_step_past_block_size_plus_budget_is_the_cleanup():
    state = InDelBlock(1, [F, T, T, T, T, T], update_steps=6 + 2)
    out, _ = step([5, M, M, M, M, M], None, {i: [(6, 0.2)] for i in range(1, 6)}, budget=2, state=state)
    assert out.cleanup and out.tokens == [5, 6, 6, 6, 6, 6]


def test_the_prompt_part_is_never_written():
    # position 0 is prompt: its argmax (DELETE, 0.99) is neither written nor applied
    out, _ = step([5, 1, 2, 3, 4, 6], [F] * 6, {0: [(DEL, 0.99)]})
    assert out.tokens[0] == 5 and out.done


def test_both_presets_keep_the_llada21_thresholds():
    assert INDEL_PRESETS["speed"] == JointThresholdInDel(0.5, 0.0)
    assert INDEL_PRESETS["quality"] == JointThresholdInDel(0.7, 0.5)
    # quality: an edit needs p > 0.5; at 0.45 the block stays
    out, _ = step([5, 1, 2, 3, 4, 6], [F] * 6, {2: [(0, 0.45)]}, rule=INDEL_PRESETS["quality"])
    assert out.tokens == [5, 1, 2, 3, 4, 6] and out.done

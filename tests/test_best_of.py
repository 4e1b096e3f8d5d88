"""best_of's choice among candidates: per prompt, the n with the highest cumulative logprob,
best first, numbered prompt by prompt (prompt 1's first choice is index n)."""

from deployments.best_of import keep_likeliest
from deployments.responses import CompletionChoice


def test_keeps_the_likeliest_per_prompt_and_renumbers():
    choices = [CompletionChoice(index=i, text=f"c{i}") for i in range(6)]
    prompt_of = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    cumulative = {0: -5.0, 1: -1.0, 2: -3.0, 3: -0.5, 4: -9.0, 5: -0.1}
    kept = keep_likeliest(choices, prompt_of, cumulative, n=2)
    assert [(c.index, c.text) for c in kept] == [(0, "c1"), (1, "c2"), (2, "c5"), (3, "c3")]

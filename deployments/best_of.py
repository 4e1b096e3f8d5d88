"""Completions' `best_of`: of the candidates generated for each prompt, the `n` with the
highest cumulative logprob (the sum, over the completion's tokens, of the model's log
probability of each token chosen), as OpenAI and vLLM define it."""

from deployments.responses import CompletionChoice


def keep_likeliest(choices: list[CompletionChoice], prompt_of: dict[int, int],
                   cumulative_logprob: dict[int, float], n: int) -> list[CompletionChoice]:
    """Per prompt, its `n` likeliest choices, best first, numbered prompt by prompt."""
    by_prompt: dict[int, list[CompletionChoice]] = {}
    for choice in choices:
        by_prompt.setdefault(prompt_of[choice.index], []).append(choice)
    kept = []
    for prompt_index in sorted(by_prompt):
        ranked = sorted(by_prompt[prompt_index], key=lambda c: cumulative_logprob[c.index], reverse=True)
        kept += [c.model_copy(update={"index": prompt_index * n + rank}) for rank, c in enumerate(ranked[:n])]
    return kept

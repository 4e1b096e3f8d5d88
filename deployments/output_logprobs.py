"""A completion's own tokens' logprobs in the two OpenAI shapes: the legacy completions one
(tokens, token_logprobs, top_logprobs, text_offset) and chat's (content entries with bytes).
The prompt's, for `echo` and vLLM's `prompt_logprobs`, are in deployments/echo.py."""

from app.outputs import TokenLogprob
from deployments.echo import TokenText
from deployments.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


def token_id_text(token_id: int) -> str:
    return f"token_id:{token_id}"


def completion_logprobs(logprobs: list[TokenLogprob] | None, offset: int, token_text: TokenText
                        ) -> CompletionLogprobs | None:
    """`offset`: where the first token starts in the choice's text."""
    if not logprobs:
        return None
    out = CompletionLogprobs()
    for lp in logprobs:
        token = token_text(lp.token_id)
        out.tokens.append(token)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({token_text(t): v for t, v in lp.top.items()})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def chat_logprobs(logprobs: list[TokenLogprob] | None, token_text: TokenText) -> ChatLogprobs | None:
    if not logprobs:
        return None
    content = []
    for lp in logprobs:
        token = token_text(lp.token_id)
        top = [TopLogprob(token=token_text(t), logprob=v, bytes=list(token_text(t).encode()))
               for t, v in lp.top.items()]
        content.append(ChatTokenLogprob(token=token, logprob=lp.logprob, bytes=list(token.encode()),
                                        top_logprobs=top))
    return ChatLogprobs(content=content)

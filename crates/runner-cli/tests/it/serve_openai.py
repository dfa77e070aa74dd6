"""The official `openai` Python client against `mtp-runner serve` (driven by tests/it/serve.rs).

Usage: python3 serve_openai.py http://127.0.0.1:PORT
A non-streaming and a streaming chat (greedy) must agree token for token; a
second turn must reuse the cached prefix; a bad parameter must come back as
the client's BadRequestError naming it. Prints `openai client: ok` at the end.
"""

import json
import sys

import openai


def main(base):
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny-mtp"], ids

    messages = [{"role": "user", "content": "def add(a, b):"}]
    whole = client.chat.completions.create(
        model="tiny-mtp", messages=messages, max_tokens=16, temperature=0
    )
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason in ("stop", "length"), whole
    usage = whole.usage
    assert usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage
    speculation = (usage.model_extra or {}).get("speculation")
    assert speculation and speculation["method"] == "mtp", usage

    stream = client.chat.completions.create(
        model="tiny-mtp",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, streamed_usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                pieces.append(delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            streamed_usage = chunk.usage
    assert "".join(pieces) == text, (pieces, text)
    assert finish == whole.choices[0].finish_reason, finish
    assert streamed_usage.completion_tokens == usage.completion_tokens, streamed_usage

    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and sub?"}]
    second = client.chat.completions.create(
        model="tiny-mtp", messages=messages, max_tokens=8, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= usage.prompt_tokens, (cached, usage.prompt_tokens)

    try:
        client.chat.completions.create(model="tiny-mtp", messages=messages, top_p=0)
        raise AssertionError("top_p=0 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == "top_p", (e.status_code, e.param)

    print("openai client: ok", json.dumps({"text": text, "cached_second_turn": cached}))


if __name__ == "__main__":
    main(sys.argv[1])

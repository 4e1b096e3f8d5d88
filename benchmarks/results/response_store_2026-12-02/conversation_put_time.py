"""The time a put of a 200-turn conversation takes in the response store (run from the repository root)."""
import asyncio, pickle, time
from deployments.response_items import request_items
from deployments.response_store import ResponseStore, StoredResponse
from deployments.responses_api_protocol import ResponseObject
async def main():
    store = ResponseStore.func_or_class(max_responses=1000)
    history, spent = [], 0.0
    for t in range(200):
        items = history + request_items([{"id": f"msg_u{t}", "role": "user", "content": "x" * 500}])
        stored = pickle.loads(pickle.dumps(StoredResponse(ResponseObject(id=f"resp_{t}", model="m"), items)))
        t0 = time.perf_counter(); await store.put(stored); spent += time.perf_counter() - t0
        history = pickle.loads(pickle.dumps((await store.get(f"resp_{t}")).conversation))
    print(f"{spent * 1e3 / 200:.3f} ms a put")
asyncio.run(main())

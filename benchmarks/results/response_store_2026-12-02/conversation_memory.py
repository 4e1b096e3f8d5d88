"""Memory the store holds for one conversation of T turns continued by previous_response_id."""
import asyncio, pickle, sys, tracemalloc
from deployments.response_items import request_items
from deployments.response_store import ResponseStore, StoredResponse
from deployments.responses_api_protocol import ResponseObject

T = int(sys.argv[1])
async def main():
    store = ResponseStore.func_or_class(max_responses=1000)
    tracemalloc.start()
    history = []
    for t in range(T):
        items = history + request_items([{"id": f"msg_u{t}", "role": "user", "content": "x" * 500}])
        stored = pickle.loads(pickle.dumps(StoredResponse(ResponseObject(id=f"resp_{t}", model="m"), items)))  # as Ray sends it
        await store.put(stored)
        history = (await store.get(f"resp_{t}")).conversation
        history = pickle.loads(pickle.dumps(history))
    del history
    current, _ = tracemalloc.get_traced_memory()
    print(f"T={T}: {current / 2**20:.1f} MiB held")
asyncio.run(main())

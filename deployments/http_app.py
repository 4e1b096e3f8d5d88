"""The FastAPI app the Ingress deployment serves: its routes are the Ingress's methods
(deployments/ingress.py, and the Responses API's in deployments/responses_route.py), bound to
the replica by `serve.ingress`. API keys, body size and encoding are checked before FastAPI
parses (RequestGate); errors are answered in OpenAI's shape."""

from fastapi import FastAPI

from deployments.openai_errors import install_error_handlers
from deployments.request_gate import RequestGate

app = FastAPI(title="specserve", docs_url=None, redoc_url=None)
app.add_middleware(RequestGate)
install_error_handlers(app)

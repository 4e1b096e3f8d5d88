"""`serve run app.builder:build_app ...` and `import_path: app.builder:build_app` keep working.

The builder lives with the deployments it binds (deployments/builder.py); this name is the
entry point users already type, so it stays, and nothing in the project imports it.
"""

from deployments.builder import build_app  # noqa: F401

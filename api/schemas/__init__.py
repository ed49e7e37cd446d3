"""The API's request and response models (pydantic): requests forbid extra fields and bound
every number; responses are what the routes promise in the OpenAPI schema."""

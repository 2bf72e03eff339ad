"""`power pull`: every artifact a manifest names, fetched from where it is published and placed only once its
size and sha256 are the manifest's (`pull.place`); the Hub through huggingface_hub (`pull.hub`), a plain HTTPS
URL through httpx (`pull.transfer`), both under one redirect rule (`pull.redirects`)."""

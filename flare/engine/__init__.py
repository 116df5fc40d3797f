"""The engine side: what turns a prepared prompt into output, below the HTTP server."""

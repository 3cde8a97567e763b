"""The serving side of the app, without gradio: what the tabs call to keep state on the server."""

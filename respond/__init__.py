"""Generated text to the Responses API's output: the `ResponseBuilder` that turns token
steps into output items, stream events and the final record, with the tool-call parsers,
the reasoning split, stop sequences, custom-tool input and log-probabilities it uses.
It imports only the vocabulary (`generation`, `items`, `errors`)."""

"""The data routes' two failures and the JSON `code` each answer carries (routes.py)."""


class DataRequestError(ValueError):
    """A request parameter is missing or out of range; the message names it."""

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


class DataUnavailable(RuntimeError):
    """Neither the hub nor the built-in corpus can serve (e.g. built-in file missing)."""


# an error answer's JSON `code`: a client decides on it, never on the message's words (a 503
# with a code is the app's answer, one without it a proxy's: daisy/batch_source.py retries those)
ERROR_CODES = {DataRequestError: "bad_parameter", DataUnavailable: "data_unavailable"}

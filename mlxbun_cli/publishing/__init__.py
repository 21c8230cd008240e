"""Publishing to the Hugging Face Hub: credentials, what a folder holds, cards, upload.

credentials.py  the Hub token: --token > HF_TOKEN > `mlxbun push login` > huggingface_hub's login
content.py      what a path holds: a model, an adapter or a dataset, and the files to send
cards.py        the README.md model / dataset card generated when a folder has none
hubapi.py       the huggingface_hub client, and its errors as one readable line each
push.py         plan a push (no network), run it (create repo, upload, one commit)

Error tree (all MlxbunError, see mlxbun_cli/errors.py):

    InputError
    ├── NoTokenError        no token anywhere (names the ways to give one)
    └── (bad repo id, bad path, job not pushable: plain InputError)
    MlxbunError
    ├── HubError            the Hub refused or could not be reached
    └── PushCancelled       the caller stopped the push before its commit

Nothing here imports mlx or mlx-lm (the isolated daemon's parent serves the
publishing routes); huggingface_hub is imported inside the functions that use it.
"""

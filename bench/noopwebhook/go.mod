module envelope.bench/noopwebhook

go 1.24

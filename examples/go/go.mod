module tide.dev/examples/train_tiny

go 1.19

require tide.dev/tide v0.0.0

replace tide.dev/tide => ../../bindings/go

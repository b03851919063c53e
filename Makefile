# gitfleet: `make demo` and `make test` are the two commands a new user runs.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build deps test vet demo bench release clean

all: build

build:
	$(GO) build -buildvcs=true -ldflags '$(LDFLAGS)' -o bin/gitfleet ./cmd/gitfleet

deps:
	./scripts/install-deps.sh

vet:
	$(GO) vet ./...

# Every test, including the ones that boot real guests under QEMU.
test: deps vet
	$(GO) test -timeout 30m ./...

demo: deps build
	./bin/gitfleet demo

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Static binaries for linux/amd64 and arm64, a .deb of each, SHA256SUMS: dist/.
release:
	GO=$(GO) ./scripts/release.sh
	GO=$(GO) ./scripts/check-release.sh

clean:
	rm -rf bin dist

# Sourced by scripts/run and scripts/test: installs what is missing, and only that, so both are
# safe to run twice. Needs the package registries (crates.io, npm, Debian), nothing else.

install_tools() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"

    local missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    if [ ! -x /usr/lib/postgresql/15/bin/initdb ] && ! command -v initdb >/dev/null 2>&1; then
        missing+=(postgresql)
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]} (Debian)"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    fi

    # The toolchain comes from rust-toolchain.toml; make sure its wasm target is there.
    rustup target add wasm32-unknown-unknown >/dev/null

    # Trunk 0.22 needs a newer rustc than the pinned one.
    if ! trunk --version 2>/dev/null | grep -q '^trunk 0\.21\.'; then
        echo "==> installing trunk 0.21.14 (about 11 minutes)"
        cargo install trunk --version 0.21.14 --locked
    fi

    # Trunk runs offline, so the wasm-bindgen CLI must be exactly the locked crate's version.
    local want have
    want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
    have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }')
    if [ "$have" != "$want" ]; then
        echo "==> installing wasm-bindgen-cli $want"
        cargo install wasm-bindgen-cli --version "$want"
    fi

    # wasm-opt: binaryen 132 from npm (Debian's 108 breaks wasm-bindgen's output).
    if [ ! -x tools/node_modules/.bin/wasm-opt ]; then
        echo "==> installing binaryen (npm) for wasm-opt"
        (cd tools && npm ci --no-audit --no-fund --silent)
    fi
    export PATH="$PWD/tools/node_modules/.bin:$HOME/.cargo/bin:$PATH"
}

# The widget, release-built into dist/: smallest code (opt-level z, LTO, wasm-opt -Oz).
build_widget() {
    echo "==> building the widget into dist/"
    trunk build --offline --release --cargo-profile wasm-release
}

fn main() -> std::process::ExitCode {
    checkout_demo_shop::main()
}

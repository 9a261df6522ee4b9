fn main() -> std::process::ExitCode {
    checkout_receipts::main()
}

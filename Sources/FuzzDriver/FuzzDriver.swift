// The libFuzzer plumbing shared by the fuzz executables (STUNFuzz, SecureFuzz).
//
// `make fuzz` builds them with `-sanitize=fuzzer,address -DFUZZING`; `run`
// then hands control to libFuzzer (LLVMFuzzerRunDriver), because SwiftPM
// renames an executable's entry point and libFuzzer's own `main` is not used.
// A plain build replays the files given as arguments through the same check,
// so a crash input reproduces with `swift run <Target> crash-…`. With
// TUSA_FUZZ_SEEDS=DIR in the environment, either build writes the target's seed
// inputs (shaped like real traffic) into DIR, one file each, and exits.
import Foundation

/// The check of the running executable; set once by `FuzzDriver.run` before
/// any input arrives, read only afterwards (libFuzzer runs inputs on one thread).
nonisolated(unsafe) private var registeredCheck: ([UInt8]) -> Void = { _ in }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    registeredCheck(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

#if FUZZING
    // libFuzzer's C symbol, named as it is.
    // swift-format-ignore: AlwaysUseLowerCamelCase
    @_silgen_name("LLVMFuzzerRunDriver")
    func LLVMFuzzerRunDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
    ) -> CInt
#endif

public enum FuzzDriver {
    /// Runs libFuzzer on `check` (FUZZING builds) or replays the files named
    /// on the command line through it.
    public static func run(name: String, check: @escaping ([UInt8]) -> Void, seeds: () -> [[UInt8]] = { [] }) {
        if let directory = ProcessInfo.processInfo.environment["TUSA_FUZZ_SEEDS"] {
            exit(writeSeeds(seeds(), name: name, into: directory))
        }
        registeredCheck = check
        #if FUZZING
            var argc = CommandLine.argc
            var argv = CommandLine.unsafeArgv
            exit(LLVMFuzzerRunDriver(&argc, &argv, { data, size in fuzzOneInput(data, size) }))
        #else
            let paths = CommandLine.arguments.dropFirst()
            if paths.isEmpty {
                print("usage: \(name) FILE... (replays inputs through the fuzz checks)")
            }
            for path in paths {
                guard let data = FileManager.default.contents(atPath: path) else {
                    print("\(path): cannot read")
                    continue
                }
                check(Array(data))
                print("\(path): ok")
            }
        #endif
    }

    /// Writes each seed to `directory` as `seed-NAME-N`; the exit status.
    private static func writeSeeds(_ seeds: [[UInt8]], name: String, into directory: String) -> Int32 {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            for (n, seed) in seeds.enumerated() {
                try Data(seed).write(to: URL(fileURLWithPath: directory).appendingPathComponent("seed-\(name)-\(n)"))
            }
            print("\(name): \(seeds.count) seeds in \(directory)")
            return 0
        } catch {
            print("\(name): cannot write seeds to \(directory): \(error)")
            return 1
        }
    }
}

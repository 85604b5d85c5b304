// libFuzzer entry point for every STUN decoder (FuzzChecks.exercise).
//
// `make fuzz` builds this with `-sanitize=fuzzer,address -DFUZZING`; `main`
// then hands control to libFuzzer (LLVMFuzzerRunDriver), because SwiftPM
// renames an executable's entry point and libFuzzer's own `main` is not used.
// A plain build replays the files given as arguments through the same checks,
// so a crash input reproduces with `swift run STUNFuzz crash-…`.
import Foundation
import STUN

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    FuzzChecks.exercise(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

#if FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
) -> CInt
#endif

@main
struct STUNFuzz {
    static func main() {
        #if FUZZING
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, { data, size in fuzzOneInput(data, size) }))
        #else
        let paths = CommandLine.arguments.dropFirst()
        if paths.isEmpty {
            print("usage: STUNFuzz FILE... (replays inputs through the fuzz checks)")
        }
        for path in paths {
            guard let data = FileManager.default.contents(atPath: path) else {
                print("\(path): cannot read")
                continue
            }
            FuzzChecks.exercise(Array(data))
            print("\(path): ok")
        }
        #endif
    }
}

import Foundation
import Testing

/// `tusa interop check` as a user runs it on folders: the project's own recorded
/// captures pass, and a folder with no capture in it is not a pass.
struct InteropCommandTests {
    static let recorded = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Interop").path

    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func theProjectsCapturesPassAndAnEmptyFolderIsNoPass() async throws {
        let tusa = try #require(Harness.tusa)
        let ours = try await Harness.run(tusa, ["interop", "check", Self.recorded], timeout: 60)
        #expect(ours.status == 0, "\(ours.stdout) \(ours.stderr)")
        #expect(ours.stdout.split(separator: "\n").filter { $0.hasPrefix(Self.recorded) }.count >= 3, "\(ours.stdout)")

        let empty = NSTemporaryDirectory() + "tusa-interop-empty-\(getpid())"
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: empty) }
        let none = try await Harness.run(tusa, ["interop", "check", empty], timeout: 20)
        #expect(none.status == 1)
        #expect(none.stderr.hasPrefix("tusa interop check: no captures in \(empty)"), "\(none.stderr)")
    }
}

import ArgumentParser
import Foundation
import Party
import STUN
import Secure
import TusaBase
import TusaInterop

extension Interop {
    /// `tusa interop decrypt`: opens the sealed media in a capture with a key log.
    struct Decrypt: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Decrypt Tusa media in a capture with a key log (TUSA_KEYLOG).",
            discussion: """
                Reads every UDP datagram of CAPTURE (pcap/pcapng), unwraps TURN ChannelData, \
                and opens the RTP media and control packets whose SSRC has keys in the key log \
                (written by an endpoint started with a key log, e.g. TUSA_KEYLOG=FILE). Prints \
                one line per stream; with --out, writes the decrypted RTP packets (header and \
                plaintext payload) as an rtpdump file, which Wireshark and rtptools read. \
                A party member's key log also holds the end-to-end sender keys: party voice \
                frames inside the opened streams are opened too (one line per member), and \
                the dump holds their audio. A relay's key log opens only its own layer: the \
                frames stay sealed. \
                Exits 1 if a packet of a logged stream or a frame under a logged key does not \
                open, or nothing was decrypted.
                """
        )

        @Argument(help: "The capture file.")
        var capture: String

        @Option(help: "The key log file.")
        var keylog: String

        @Option(help: "Write the decrypted RTP packets to this rtpdump file.")
        var out: String?

        func run() throws {
            let keys: [UInt32: [SecretKey]]
            let frames: PartyFrameOpener
            do {
                let text = try String(contentsOfFile: keylog, encoding: .utf8)
                keys = try KeyLog.parse(text)
                frames = PartyFrameOpener(keys: try KeyLog.parseParty(text))
            } catch let e as KeyLog.ParseError {
                fail("\(keylog): \(e)")
            } catch {
                fail("cannot read \(keylog): \(error.localizedDescription)")
            }
            let cap: Capture
            do { cap = try Capture.read(path: capture) } catch { fail("\(capture): \(error)") }
            let decryptor = MediaDecryptor(keys: keys)
            var streams: [UInt32: (media: Int, control: Int, failed: Int)] = [:]
            var noKey: Set<UInt32> = []
            var party: [MemberID: (opened: Int, failed: Int)] = [:]
            var partyNoKey = 0
            var dump = RTPDumpWriter()
            for d in cap.udp {
                var bytes = d.payload
                if PacketKind.classify(bytes) == .channelData {
                    guard let frame = try? ChannelData(decoding: bytes) else { continue }
                    bytes = frame.data
                }
                switch decryptor.open(&bytes) {
                case .media(let header, let range):
                    streams[header.ssrc, default: (0, 0, 0)].media += 1
                    var payload = Array(bytes[range])
                    if header.payloadType == PartyHop.payloadType, !frames.isEmpty {
                        switch frames.open(payload) {
                        case .opened(let frame, let audio):
                            party[frame.sender, default: (0, 0)].opened += 1
                            payload = audio
                        case .failed(let frame, _):
                            party[frame?.sender ?? MemberID(0), default: (0, 0)].failed += 1
                        case .noKey:
                            partyNoKey += 1
                        case .notAFrame:
                            break
                        }
                    }
                    dump.add(Array(bytes[..<header.headerLength]) + payload, at: d.timestamp)
                case .control(let ssrc, _):
                    streams[ssrc, default: (0, 0, 0)].control += 1
                case .failed(let ssrc):
                    streams[ssrc, default: (0, 0, 0)].failed += 1
                case .noKey(let ssrc):
                    noKey.insert(ssrc)
                case .notRTP:
                    continue
                }
            }
            for (ssrc, s) in streams.sorted(by: { $0.key < $1.key }) {
                print(
                    "SSRC 0x\(String(ssrc, radix: 16)): \(s.media) media and \(s.control) control packets decrypted, \(s.failed) failed"
                )
            }
            if !noKey.isEmpty {
                print(
                    "no key for \(noKey.count) SSRC(s): \(noKey.sorted().map { "0x" + String($0, radix: 16) }.joined(separator: " "))"
                )
            }
            for (member, p) in party.sorted(by: { $0.key < $1.key }) {
                print("party member \(member): \(p.opened) voice frames opened, \(p.failed) failed")
            }
            if partyNoKey > 0 { print("party: \(partyNoKey) voice frames under keys not in the log") }
            if let out {
                do { try Data(dump.bytes).write(to: URL(fileURLWithPath: out)) } catch {
                    fail("cannot write \(out): \(error.localizedDescription)")
                }
                print("wrote \(dump.count) RTP packets to \(out)")
            }
            let decrypted = streams.values.reduce(0) { $0 + $1.media + $1.control }
            if decrypted == 0 { fail("nothing in \(capture) opened with the keys in \(keylog)") }
            if streams.values.contains(where: { $0.failed > 0 }) || party.values.contains(where: { $0.failed > 0 }) {
                throw ExitCode(1)
            }
        }

        private func fail(_ message: String) -> Never {
            FileHandle.standardError.write(Data("tusa interop decrypt: \(message)\n".utf8))
            Foundation.exit(1)
        }
    }
}

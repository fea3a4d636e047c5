#include "starling/net/zap_handler.h"

#include <array>
#include <vector>

#include "starling/net/quiet_thread.h"
#include "starling/net/zmq_frames.h"

namespace starling::net {

ZapHandler::ZapHandler(zmq::context_t& context, std::set<std::string> allowed_keys, LogFn log)
    : socket_(context, zmq::socket_type::rep),
      allowed_(std::move(allowed_keys)),
      log_(std::move(log)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = quiet_thread([this] { run(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  thread_.join();
}

void ZapHandler::run() {
  while (!stop_) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
    const std::vector<zmq::message_t> frames = read_frames(socket_);
    // version, request id, domain, address, identity, mechanism, credentials...
    std::string status = "400", text = "malformed request", user;
    const std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
    if (frames.size() >= 6) {
      const std::string address = frames[3].to_string(), mechanism = frames[5].to_string();
      if (mechanism == "CURVE" && frames.size() >= 7 && frames[6].size() == 32) {
        char z85[41];
        zmq_z85_encode(z85, static_cast<const uint8_t*>(frames[6].data()), 32);
        if (allowed_.count(z85)) {
          status = "200";
          text = "OK";
          user = z85;
        } else {
          text = "key not on the allowlist";
          ++refused_;
          log_("refused a connection from " + address + ": public key " + z85 +
               " is not on the allowlist");
        }
      } else {
        text = "mechanism " + mechanism + " is not accepted";
        ++refused_;
        log_("refused a connection from " + address + ": mechanism " + mechanism);
      }
    }
    const std::array<std::string, 6> reply{"1.0", request_id, status, text, user, ""};
    for (size_t i = 0; i < reply.size(); ++i)
      socket_.send(zmq::buffer(reply[i]),
                   i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

}  // namespace starling::net

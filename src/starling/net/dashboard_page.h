// The dashboard's web page (dashboard.h): one self-contained HTML document, its script and style
// inline, no resources from elsewhere (a swarm may run where nothing outside can be reached).
#pragma once

namespace starling::net {

const char* dashboard_page();

}  // namespace starling::net

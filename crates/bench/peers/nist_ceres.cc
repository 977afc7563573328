// Grades C++ Ceres on NIST's 27 StRD nonlinear regression problems from both starts, as
// residual-compile's examples/nist.rs grades our solver: the worst certified parameter's log
// relative error (LRE). The models are written as in crates/residual-compile/tests/common/nist.rs.
//
//   apt-get install libceres-dev
//   g++ -O2 -std=c++17 crates/bench/peers/nist_ceres.cc -o /tmp/nist_ceres -I/usr/include/eigen3 \
//       -lceres -lglog -lgflags -lpthread
//   OMP_THREAD_LIMIT=1 /tmp/nist_ceres crates/residual-compile/tests/data/nist          (defaults)
//   OMP_THREAD_LIMIT=1 /tmp/nist_ceres crates/residual-compile/tests/data/nist tight    (ours)
//
// `tight` sets residual-compile's default tolerances (function 1e-16, parameter 1e-14,
// gradient 1e-10, 2,000 iterations) in place of Ceres's.
#include <ceres/ceres.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <algorithm>
#include <dirent.h>

struct Data { std::string name; std::vector<double> s1, s2, cert; std::vector<std::vector<double>> rows; };

static bool parse(const std::string& path, const std::string& name, Data& d) {
  std::ifstream f(path); std::string line; bool data = false; d.name = name;
  while (std::getline(f, line)) {
    std::string t = line; t.erase(0, t.find_first_not_of(" \t\r")); while (!t.empty() && (t.back()=='\r'||t.back()==' ')) t.pop_back();
    if (data) { if (t.empty()) continue; std::istringstream is(t); std::vector<double> r; double v; while (is >> v) r.push_back(v); d.rows.push_back(r); continue; }
    if (t.rfind("Data:", 0) == 0) { std::istringstream is(t.substr(5)); std::string w; is >> w; data = (w == "y"); continue; }
    if (!t.empty() && t[0]=='b' && t.find('=') != std::string::npos) { std::istringstream is(t.substr(t.find('=')+1)); double a,b,c,e; is >> a >> b >> c >> e; d.s1.push_back(a); d.s2.push_back(b); d.cert.push_back(c); }
  }
  return !d.rows.empty();
}

struct Model {
  std::string name; std::vector<double> row;
  template <typename T> bool operator()(T const* const* p, T* r) const {
    const T* b = p[0]; T x = T(row[1]); T f; const double pi = M_PI;
    const std::string& n = name;
    if (n=="Misra1a"||n=="BoxBOD") f = b[0]*(1.0-exp(-b[1]*x));
    else if (n=="Misra1b") f = b[0]*(1.0-pow(1.0+b[1]*x*0.5, -2.0));
    else if (n=="Misra1c") f = b[0]*(1.0-pow(1.0+2.0*b[1]*x, -0.5));
    else if (n=="Misra1d") f = b[0]*b[1]*x/(1.0+b[1]*x);
    else if (n=="Chwirut1"||n=="Chwirut2") f = exp(-b[0]*x)/(b[1]+b[2]*x);
    else if (n.rfind("Lanczos",0)==0) f = b[0]*exp(-b[1]*x)+b[2]*exp(-b[3]*x)+b[4]*exp(-b[5]*x);
    else if (n.rfind("Gauss",0)==0) f = b[0]*exp(-b[1]*x)+b[2]*exp(-(x-b[3])*(x-b[3])/(b[4]*b[4]))+b[5]*exp(-(x-b[6])*(x-b[6])/(b[7]*b[7]));
    else if (n=="DanWood") f = b[0]*pow(x, b[1]);
    else if (n=="Kirby2") f = (b[0]+b[1]*x+b[2]*x*x)/(1.0+b[3]*x+b[4]*x*x);
    else if (n=="Hahn1"||n=="Thurber") f = (b[0]+b[1]*x+b[2]*x*x+b[3]*x*x*x)/(1.0+b[4]*x+b[5]*x*x+b[6]*x*x*x);
    else if (n=="Nelson") { T x2 = T(row[2]); f = b[0]-b[1]*x*exp(-b[2]*x2); r[0] = T(std::log(row[0])) - f; return true; }
    else if (n=="MGH17") f = b[0]+b[1]*exp(-x*b[3])+b[2]*exp(-x*b[4]);
    else if (n=="Roszman1") f = b[0]-b[1]*x-atan(b[2]/(x-b[3]))/pi;
    else if (n=="ENSO") f = b[0]+b[1]*cos(2.0*pi*x/12.0)+b[2]*sin(2.0*pi*x/12.0)+b[4]*cos(2.0*pi*x/b[3])+b[5]*sin(2.0*pi*x/b[3])+b[7]*cos(2.0*pi*x/b[6])+b[8]*sin(2.0*pi*x/b[6]);
    else if (n=="MGH09") f = b[0]*(x*x+x*b[1])/(x*x+x*b[2]+b[3]);
    else if (n=="Rat42") f = b[0]/(1.0+exp(b[1]-b[2]*x));
    else if (n=="MGH10") f = b[0]*exp(b[1]/(x+b[2]));
    else if (n=="Eckerle4") f = (b[0]/b[1])*exp(-0.5*((x-b[2])/b[1])*((x-b[2])/b[1]));
    else if (n=="Rat43") f = b[0]/pow(1.0+exp(b[1]-b[2]*x), 1.0/b[3]);
    else if (n=="Bennett5") f = b[0]*pow(b[1]+x, -1.0/b[2]);
    else return false;
    r[0] = T(row[0]) - f; return true;
  }
};

static double lre(double g, double w) { double rel = std::fabs(g-w)/std::fabs(w); if (rel == 0) return 11; if (std::isnan(rel)) return 0; return std::min(11.0, std::max(0.0, -std::log10(rel))); }

int main(int argc, char** argv) {
  std::string dir = argv[1]; bool tight = argc > 2;
  std::vector<std::string> names; DIR* dp = opendir(dir.c_str()); struct dirent* e;
  while ((e = readdir(dp))) { std::string s = e->d_name; if (s.size() > 4 && s.substr(s.size()-4) == ".dat") names.push_back(s.substr(0, s.size()-4)); }
  std::sort(names.begin(), names.end());
  int runs = 0, four = 0, six = 0;
  for (auto& name : names) {
    Data d; if (!parse(dir + "/" + name + ".dat", name, d)) { printf("%s: unreadable\n", name.c_str()); continue; }
    for (int s = 0; s < 2; ++s) {
      std::vector<double> b = s == 0 ? d.s1 : d.s2;
      ceres::Problem p;
      for (auto& row : d.rows) {
        auto* cf = new ceres::DynamicAutoDiffCostFunction<Model, 9>(new Model{name, row});
        cf->AddParameterBlock((int)b.size()); cf->SetNumResiduals(1);
        p.AddResidualBlock(cf, nullptr, b.data());
      }
      ceres::Solver::Options o;
      if (tight) { o.max_num_iterations = 2000; o.function_tolerance = 1e-16; o.parameter_tolerance = 1e-14; o.gradient_tolerance = 1e-10; }
      ceres::Solver::Summary sm; ceres::Solve(o, &p, &sm);
      double worst = 11; for (size_t i = 0; i < b.size(); ++i) worst = std::min(worst, lre(b[i], d.cert[i]));
      runs++; four += worst >= 4; six += worst >= 6;
      printf("%-9s start %d: parameter LRE %4.1f (%d iterations)\n", name.c_str(), s+1, worst, (int)sm.iterations.size());
    }
  }
  printf("ceres %s: LRE >= 4 on %d of %d runs, LRE >= 6 on %d of %d\n", tight ? "(our tolerances)" : "(defaults)", four, runs, six, runs);
}
